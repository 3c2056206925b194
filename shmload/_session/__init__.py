"""One set of workers and their ring: starting and supervising workers, allocating slots,
dispatching tasks, results, lifetimes of batches.
"""
