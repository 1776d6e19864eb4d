WHERE = "imported from the real folder"
