"""Walks over the recorded graph: the text trace, the drawing, the flow table, tt.trace and anomaly checks."""
