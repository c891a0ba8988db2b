import socket, sys, threading, time
port=int(sys.argv[1]); secs=float(sys.argv[2])
s=socket.create_connection(("127.0.0.1",port))
batch=b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"*256
got=[0]
def rd():
    while True:
        try:
            d=s.recv(1<<16)
        except OSError:
            break
        if not d: break
        got[0]+=d.count(b"HTTP/1.1 200")
t=threading.Thread(target=rd,daemon=True); t.start()
end=time.time()+secs
while time.time()<end:
    try: s.sendall(batch)
    except OSError: break
print("hog responses:", got[0])
