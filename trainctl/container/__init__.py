"""What runs on a node: the source archive and the in-container layout."""
