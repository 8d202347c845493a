"""Operations: migrations, DSN resolution, the embedded PostgreSQL."""
