"""Everything a run leaves for people and machines (HTML, Markdown, CSV, junit), made from RunResults alone."""
