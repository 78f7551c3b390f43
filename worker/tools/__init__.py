"""How a model is told about tools and how it writes its calls, one protocol per kind of model;
the client's strings a template renders outside the message contents, kept text (outside.py);
and system messages after the start, for a template that renders none there (late_system.py)."""
