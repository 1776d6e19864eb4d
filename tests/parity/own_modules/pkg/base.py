scale = 2
