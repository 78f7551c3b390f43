"""The pool as this API process tends it: worker registry, reaper, figures, background tasks."""
