"""HOW a recipe becomes an image: Jinja2 templates, the renderer, and the Docker SDK build."""
