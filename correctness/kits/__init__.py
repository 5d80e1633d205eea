"""Test kits: worker functions and toy models for spawned process groups. Importing registers nothing.

They sit beside the tests, not in the library: a spawned child unpickles a worker by its qualified
name (`kits.<module>:fn`) and can import it because spawn hands the parent's sys.path to the child,
and the root conftest.py puts correctness/ on it."""
