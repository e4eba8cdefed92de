"""The terminal adapter behind ``kesoku chat`` (a skeleton until the chat issue lands)."""
