"""Data: the DLRM file format and its synthetic generator, recorded and generated lookups, task sampling."""
