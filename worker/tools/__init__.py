"""How a model is told about tools and how it writes its calls: one protocol per kind of model.
The client's strings that a template renders outside the message contents stay text (outside.py).
System messages after the start are folded in for a template that renders none there
(late_system.py)."""
