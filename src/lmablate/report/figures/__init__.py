"""The report's figures, drawn with seaborn from the report's tables."""
