"""Model definitions and loading: the project's own Llama-family decoder."""
