"""Samples into batches: the layout of a batch, the collate plan and its writes into a
slot, split batches' parts.
"""
