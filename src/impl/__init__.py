"""impl: the implementations measured by the suite."""
