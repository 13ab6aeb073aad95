"""Read models and text: status, show, previews, reports."""
