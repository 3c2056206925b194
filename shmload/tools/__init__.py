"""Tools around the loader, not on its data path: the ``shmload`` command (``cli``), its
``demo``, and the synthetic datasets they and the examples use (``synthetic``)."""
