"""The ``pgjobs web`` dashboard."""
