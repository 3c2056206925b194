"""The user's side: DataLoader, its settings, the pool of sessions, an epoch's iterator,
progress and resume, reordering.
"""
