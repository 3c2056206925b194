"""The bottom layer: argument checks, the platform (start methods, signals and the
interrupt window), units, torch-if-imported.
"""
