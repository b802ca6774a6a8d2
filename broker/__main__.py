from isrlab.broker.cli import main

main()
