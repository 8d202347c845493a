"""The client layer: typed calls of the SQL functions (the only place with SQL text, besides ops/ migrations)."""

from pgjobs.client.clients import AsyncClient, Client

__all__ = ["AsyncClient", "Client"]
