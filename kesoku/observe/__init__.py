"""What an operator reads afterwards: turn logs (and their disk cap), HTML traces, token usage.

Never on the turn's critical path: the turn log is written by a separate process
(ARCHITECTURE.md, "Turn logs").
"""
