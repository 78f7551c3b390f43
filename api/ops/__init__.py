"""The operator's routes: probes, metrics, internal port, OpenAPI, model list, browser pages."""
