"""TRM and HRM: our recursive arms beside the published numbers (paper) and the pages' collectors and blocks
(pages)."""
