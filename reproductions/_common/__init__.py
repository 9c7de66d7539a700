"""What the reproductions share: the papermill driver (:mod:`.driver`, ``pipelab reproduce``) and the
CSV, Markdown, SVG and plotly output with the merged offline report (:mod:`.report`)."""
