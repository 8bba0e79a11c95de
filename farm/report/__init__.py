"""`farm report` / `farm view`: a static HTML report of an output directory (reads files only)."""
