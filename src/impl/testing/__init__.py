"""Test kits: worker functions and toy models for spawned process groups. Importing registers nothing."""
