"""Keeping a store: the ager, event retention and the month partitions it drops, the
migrations, copying a store, and its status."""
