"""Deterministic simulation (issue 18): the parts that exist so far.

- `clock`: an asyncio event loop on virtual time (timers fire in virtual time, nothing sleeps).
"""
