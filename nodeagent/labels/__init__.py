"""Node labels as a pure function of the Inventory (and the MPS state), and their sinks."""
