"""How a model is told about tools and how it writes its calls, one protocol per kind of model."""
