"""Secret scanning and redaction (`secrets`): a leaf package, importing nothing of trajforge, so the
export's scan, the vLLM server's command line, the CPU profile and the flow's stored parameters all
share one redaction without reaching into each other."""
