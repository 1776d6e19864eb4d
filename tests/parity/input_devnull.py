# parity: fast
# input() with nothing on stdin: EOFError. (The lab's stdin is /dev/null: compared with python < /dev/null.)
name = input("name? ")
print("got", name)
