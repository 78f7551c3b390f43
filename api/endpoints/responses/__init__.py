"""The Responses API: its body, conversation items, objects, events and routes."""
