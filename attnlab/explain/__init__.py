"""``attnlab explain``: look inside the mechanism on your own model, with a measured number beside each picture.

capture.py records what every attention layer computed in a real forward pass (its queries and keys) and turns
it into the attention weights; views.py builds each view's data (attention, the budget, prefill vs decode, the n^2
grid, order, a recurrence); app.py serves them and the page (static/).
"""
