from k3sim.cli import main

main()
