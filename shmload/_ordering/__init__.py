"""What is loaded in which order: samplers, sharding across ranks, seeds, shuffling, the
schedule over workers, iterable sources.
"""
