"""The Discord adapter: discord.py inside trio-asyncio (a skeleton until the Discord issue lands)."""
