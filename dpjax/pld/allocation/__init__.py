"""Random allocation and balls-in-bins: the lattice laws, the accountant and its DP-SGD entry points."""
