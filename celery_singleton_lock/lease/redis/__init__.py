"""Leases in one Redis server (any topology): the store, its asyncio twin, clients from
URLs, calls pipelined on redis-py's connections, the inventory, and the Lua they run."""
