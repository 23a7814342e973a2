"""A DNS server for tests, on UDP: answers A questions for the names given
(after an optional delay, NXDOMAIN before it, as for a record that appears
only once its pod is ready) and never answers AAAA questions for them, as a
container DNS server does that forwards those to an upstream it cannot
reach. Every other name is NXDOMAIN.

  fake_dns.py LISTEN_IP PORT_FILE DELAY_SECONDS NAME=IP [NAME=IP ...]
"""
import socket
import struct
import sys
import time

listen, port_file, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
records = dict(arg.split("=", 1) for arg in sys.argv[4:])
start = time.monotonic()

sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind((listen, 53))
with open(port_file, "w") as f:
    f.write("53\n")


def question(packet):
    labels, at = [], 12
    while packet[at]:
        n = packet[at]
        labels.append(packet[at + 1:at + 1 + n].decode("ascii", "replace"))
        at += 1 + n
    qtype, = struct.unpack("!H", packet[at + 1:at + 3])
    return ".".join(labels).lower(), qtype, at + 5


deadline = time.monotonic() + 600  # bounded, as every test loop is
while time.monotonic() < deadline:
    sock.settimeout(1)
    try:
        packet, peer = sock.recvfrom(512)
    except socket.timeout:
        continue
    try:
        name, qtype, end = question(packet)
    except (IndexError, struct.error):
        continue
    ip = records.get(name)
    if ip is not None and qtype == 28:  # AAAA: the forward that never returns
        continue
    ready = time.monotonic() - start >= delay
    header = bytearray(packet[:12])
    header[2] = 0x84 | (packet[2] & 0x01)  # response, authoritative, RD copied
    if ip is not None and qtype == 1 and ready:
        header[3] = 0x80  # RA, NOERROR
        header[6:8] = struct.pack("!H", 1)
        answer = struct.pack("!HHHIH", 0xC00C, 1, 1, 5, 4) + socket.inet_aton(ip)
    else:
        header[3] = 0x83 if ip is None or not ready else 0x80  # NXDOMAIN
        header[6:8] = struct.pack("!H", 0)
        answer = b""
    header[8:12] = b"\0\0\0\0"
    sock.sendto(bytes(header) + packet[12:end] + answer, peer)
