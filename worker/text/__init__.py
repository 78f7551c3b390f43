"""Generated tokens as the client's text: pieces, stop strings, and the reply's content."""
