"""Trajectory files (HDF5): schema, writer, reader, validator."""
