"""The endpoints that create jobs (chat, completions, Responses): bodies, objects, events, routes."""
