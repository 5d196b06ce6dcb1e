"""One module per DVC stage: read its params group and input artifacts, call the library, write outputs."""
