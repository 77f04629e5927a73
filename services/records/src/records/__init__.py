"""The records service: workspace tables and the records in them."""
