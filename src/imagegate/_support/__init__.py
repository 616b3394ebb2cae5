"""What every ring uses and none owns: the deadline, interrupts and workers, bounded files, names, sizes, the shipped resources, the engine's host."""
