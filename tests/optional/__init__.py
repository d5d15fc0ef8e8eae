"""The tests of the optional parts (project/optional/), one folder each: deleted with the part."""
