"""What a worker (or num_workers=0) runs: fetching samples and writing them into their
slot, and reporting.
"""
