"""How a model is told about tools and how it writes its calls, one protocol per kind of model;
and the client's strings a template renders outside the message contents, kept text (outside.py)."""
