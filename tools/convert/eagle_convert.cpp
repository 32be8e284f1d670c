// Placeholder: replaced by the converter implementation.
