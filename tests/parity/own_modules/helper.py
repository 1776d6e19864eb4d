def greet():
    return "hello from helper"
