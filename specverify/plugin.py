"""pytest plugin (pytest11 entry point); filled in by the plugin issue."""
