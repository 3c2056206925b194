"""Shared memory and messages: segments (memfd or POSIX), the ring of slots and its bound,
the control block, sockets and their wire format, page-locking.
"""
