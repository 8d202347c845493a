"""The runtime layer: the app registry, the worker, the scheduler. Talks to PostgreSQL only through pgjobs.client."""
