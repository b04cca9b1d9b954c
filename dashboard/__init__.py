"""Promesa: webhook delivery that keeps its promises. `dashboard.app.create_app` builds the web app."""
